-- PostgreSQL role and database for peloton. Run as a superuser, then create the schema:
--   psql -h DBHOST -U postgres -v password='...' -f deploy/postgres/setup.sql
--   peloton db upgrade --db-url 'postgresql://peloton:...@DBHOST:5432/peloton'
-- psql variables: password (required), role and dbname (default: peloton). Running it again
-- changes nothing but the password.
\set ON_ERROR_STOP on
\if :{?password}
\else
  DO $$ BEGIN RAISE EXCEPTION 'set the role''s password: psql -v password=... -f setup.sql'; END $$;
\endif
\if :{?role}
\else
  \set role peloton
\endif
\if :{?dbname}
\else
  \set dbname peloton
\endif

-- The daemon's login: no superuser, no role or database creation.
SELECT format('CREATE ROLE %I LOGIN', :'role')
WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = :'role') \gexec
ALTER ROLE :"role" WITH LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE PASSWORD :'password';

-- Owned by that role, so `peloton db upgrade` (Alembic) can create and alter its tables.
SELECT format('CREATE DATABASE %I OWNER %I ENCODING %L', :'dbname', :'role', 'UTF8')
WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = :'dbname') \gexec
REVOKE ALL ON DATABASE :"dbname" FROM PUBLIC;
GRANT CONNECT, TEMPORARY ON DATABASE :"dbname" TO :"role";
