"""Per-pool permissions: the pure rules (peloton.core.access), grants in pool configs, YAML and
storage, job owners in the database (SQLite and PostgreSQL) and migration 0011."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, inspect, text
from support import make_spec

from peloton.api.authz import RULES, On
from peloton.api.pool_service import config_from_pb, spec_pb
from peloton.config import ServerConfig
from peloton.core.access import (
    ANONYMOUS,
    GROUP,
    ROOT,
    USER,
    Caller,
    Grant,
    Permission,
    PoolGrants,
    Principal,
    allows,
    lineage,
    parse_admins,
    parse_grant,
    parse_principal,
    permission_on,
    viewable,
)
from peloton.core.pools import PoolConfig, validate_config
from peloton.core.records import JobFilter
from peloton.core.spec import load_pool_spec_yaml
from peloton.errors import AlreadyExists, InvalidArgument
from peloton.jobmgr.manager import JobManager
from peloton.storage import migrate
from peloton.storage.db import make_engine
from peloton.storage.models import PoolRow
from peloton.storage.pools import config_of, config_to_json
from peloton.v1 import pool_pb2

V, S, A = Permission.VIEW, Permission.SUBMIT, Permission.ADMIN
ALICE = Caller("alice", frozenset({"ml"}), "token")
BOB = Caller("bob", frozenset(), "certificate")


def user(name: str, permission: Permission) -> Grant:
    return Grant(Principal(USER, name), permission)


def group(name: str, permission: Permission) -> Grant:
    return Grant(Principal(GROUP, name), permission)


# ---------------------------------------------------------------- parsing


def test_parse_principals_grants_and_admins() -> None:
    assert parse_principal("user:alice", "f") == Principal(USER, "alice")
    assert parse_principal(" group:ml ", "f") == Principal(GROUP, "ml")
    assert parse_grant("SUBMIT=user:alice", "f") == user("alice", S)
    assert str(parse_grant("admin=group:sre", "f")) == "admin=group:sre"
    assert parse_admins("user:ops, group:sre,") == {Principal(USER, "ops"), Principal(GROUP, "sre")}
    assert parse_admins("") == frozenset()


@pytest.mark.parametrize(
    ("text", "field", "reason"),
    [
        ("alice", "f", "'alice' is not user:NAME or group:NAME"),
        ("role:x", "f", "is not user:NAME or group:NAME"),
        ("user:", "f", "is empty"),
        ("user:a b", "f", "may not hold spaces"),
        ("user:" + "x" * 129, "f", "longer than 128"),
    ],
)
def test_bad_principals_name_the_field(text: str, field: str, reason: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        parse_principal(text, field)
    assert info.value.field == field and reason in info.value.reason


def test_bad_grants_and_admins_name_the_entry() -> None:
    with pytest.raises(InvalidArgument, match=r"^--grant\[0\]: unknown permission 'own'"):
        parse_grant("own=user:alice", "--grant[0]")
    with pytest.raises(InvalidArgument, match=r"is not PERMISSION=user:NAME"):
        parse_grant("user:alice", "g")
    with pytest.raises(InvalidArgument) as info:
        parse_admins("user:ops,sre")
    assert info.value.field == "admins[1]"


def test_the_admins_option_is_checked_with_the_config() -> None:
    config = ServerConfig(admins="user:ops,group:sre")
    assert config.admin_principals == {Principal(USER, "ops"), Principal(GROUP, "sre")}
    with pytest.raises(InvalidArgument) as info:
        ServerConfig(admins="user:ops,ops")
    assert str(info.value) == "admins[1]: 'ops' is not user:NAME or group:NAME"


def test_lineage_ends_at_the_root() -> None:
    assert lineage("/a/b/c") == ["/a/b/c", "/a/b", "/a", ROOT]
    assert lineage(ROOT) == [ROOT]
    assert lineage("relative") == ["relative", ROOT]  # never loops on a bad path


# ---------------------------------------------------------------- decisions

GRANTS: PoolGrants = {
    "/research": [group("ml", V)],
    "/research/vision": [user("alice", S)],
    "/research/nlp": [user("bob", A)],
}


def test_inherited_permissions_are_the_union_down_the_tree() -> None:
    assert permission_on(ALICE, "/research", GRANTS, frozenset()) is V  # via group ml
    assert permission_on(ALICE, "/research/vision", GRANTS, frozenset()) is S
    assert permission_on(ALICE, "/research/vision/x", GRANTS, frozenset()) is S
    assert permission_on(ALICE, "/research/nlp", GRANTS, frozenset()) is V
    assert permission_on(ALICE, "/other", GRANTS, frozenset()) is None
    # A grant on a pool gives nothing on its parent or its siblings.
    assert permission_on(BOB, "/research", GRANTS, frozenset()) is None
    assert permission_on(BOB, "/research/vision", GRANTS, frozenset()) is None
    assert allows(BOB, A, "/research/nlp/deep", GRANTS, frozenset())


def test_admin_implies_submit_implies_view() -> None:
    assert allows(ALICE, V, "/research/vision", GRANTS, frozenset())
    assert allows(ALICE, S, "/research/vision", GRANTS, frozenset())
    assert not allows(ALICE, A, "/research/vision", GRANTS, frozenset())
    assert not allows(ALICE, S, "/research", GRANTS, frozenset())


def test_cluster_admins_by_user_or_group_are_admin_everywhere() -> None:
    admins = parse_admins("user:ops,group:sre")
    for caller in (Caller("ops", frozenset(), "jwt"), Caller("x", frozenset({"sre"}), "token")):
        assert permission_on(caller, "/anything", {}, admins) is A
        assert allows(caller, A, ROOT, {}, admins)
        assert viewable(caller, ["/a"], {}, admins) is None  # every pool
    assert not allows(ALICE, A, ROOT, GRANTS, admins)
    # The root holds no grants, so only the admins option makes a cluster admin.
    assert not allows(BOB, A, ROOT, GRANTS, frozenset())


def test_the_anonymous_caller_may_do_everything_but_matches_no_grant() -> None:
    # A daemon without authentication: exactly as before permissions existed.
    assert allows(ANONYMOUS, A, ROOT, {}, frozenset())
    assert viewable(ANONYMOUS, ["/a"], {}, frozenset()) is None
    # An empty user name is no user: a grant never matches the anonymous caller.
    assert not Principal(USER, "").matches(ANONYMOUS)
    assert permission_on(ANONYMOUS, "/a", {"/a": [user("", A)]}, frozenset()) is None


def test_viewable_pools() -> None:
    paths = ["/default", "/research", "/research/vision", "/research/nlp"]
    assert viewable(BOB, paths, GRANTS, frozenset()) == frozenset({"/research/nlp"})
    assert viewable(ALICE, paths, GRANTS, frozenset()) == frozenset(
        {
            "/research",
            "/research/vision",
            "/research/nlp",
        }
    )
    assert viewable(Caller("eve", frozenset(), "token"), paths, GRANTS, frozenset()) == frozenset()


# ---------------------------------------------------------------- properties over random trees

SEGMENTS = ("a", "b", "c")
CALLERS = [
    Caller("u0", frozenset(), "token"),
    Caller("u1", frozenset({"g0"}), "token"),
    Caller("u2", frozenset({"g0", "g1"}), "jwt"),
]
principals = st.sampled_from(
    [Principal(USER, "u0"), Principal(USER, "u1"), Principal(GROUP, "g0"), Principal(GROUP, "g1")]
)
grants_st = st.builds(Grant, principals, st.sampled_from(list(Permission)))


@st.composite
def trees(draw: st.DrawFn) -> tuple[list[str], dict[str, list[Grant]]]:
    """A pool tree (every pool's parent in it) of depth up to 3 with random grants."""
    paths: list[str] = []
    frontier = [ROOT]
    for _ in range(draw(st.integers(1, 12))):
        parent = draw(st.sampled_from(frontier))
        child = (parent.rstrip("/") + "/" + draw(st.sampled_from(SEGMENTS))) or ROOT
        if child not in paths and child.count("/") <= 3:
            paths.append(child)
            frontier.append(child)
    grants = {p: draw(st.lists(grants_st, max_size=3)) for p in paths}
    return paths, grants


def _level(p: Permission | None) -> int:
    return 0 if p is None else int(p)


@settings(max_examples=200, deadline=None)
@given(trees(), st.sampled_from(CALLERS))
def test_permissions_only_grow_down_the_tree(
    tree: tuple[list[str], dict[str, list[Grant]]], caller: Caller
) -> None:
    paths, grants = tree
    for path in paths:
        parent = lineage(path)[1]
        assert _level(permission_on(caller, path, grants, frozenset())) >= _level(
            permission_on(caller, parent, grants, frozenset())
        )


@settings(max_examples=200, deadline=None)
@given(trees(), st.sampled_from(CALLERS))
def test_admin_contains_submit_contains_view(
    tree: tuple[list[str], dict[str, list[Grant]]], caller: Caller
) -> None:
    paths, grants = tree
    for path in [ROOT, *paths]:
        held = [allows(caller, p, path, grants, frozenset()) for p in (A, S, V)]
        assert held == sorted(held)  # False... then True...: each implies those after it


@settings(max_examples=200, deadline=None)
@given(trees(), grants_st, st.data())
def test_a_grant_reaches_only_its_pool_and_below(
    tree: tuple[list[str], dict[str, list[Grant]]], grant: Grant, data: st.DataObject
) -> None:
    paths, grants = tree
    target = data.draw(st.sampled_from(paths))
    more = {**grants, target: [*grants[target], grant]}
    for caller in CALLERS:
        for path in [ROOT, *paths]:
            before = permission_on(caller, path, grants, frozenset())
            after = permission_on(caller, path, more, frozenset())
            if target not in lineage(path):  # a parent, a sibling, a cousin
                assert after == before
            else:
                assert _level(after) >= _level(before)
                if grant.principal.matches(caller):
                    assert _level(after) >= grant.permission


# ---------------------------------------------------------------- the rule table


def test_every_rule_names_a_permission_unless_open_to_anyone() -> None:
    for method, rule in RULES.items():
        assert (rule.permission is None) == (rule.on is On.ANYONE), method
        assert rule.on is On.ANYONE or rule.action, method


# ---------------------------------------------------------------- grants in pool configs


def _spec_with(*grants: pool_pb2.Grant) -> pool_pb2.PoolSpec:
    return pool_pb2.PoolSpec(path="/research", grants=list(grants))


def test_grants_round_trip_through_proto_and_storage() -> None:
    spec = _spec_with(
        pool_pb2.Grant(user="alice", permission=pool_pb2.PERMISSION_SUBMIT),
        pool_pb2.Grant(group="ml", permission=pool_pb2.PERMISSION_VIEW),
    )
    config = config_from_pb(spec)
    assert config.grants == (user("alice", S), group("ml", V))
    assert list(spec_pb(config).grants) == list(spec.grants)
    row = PoolRow(path=config.path, owner="", config=config_to_json(config))
    assert config_of(row) == config
    # A pool stored before grants existed has none.
    old = PoolRow(path="/old", owner="", config='{"kinds": {}, "queue_policy": "FIFO"}')
    assert config_of(old).grants == ()


@pytest.mark.parametrize(
    ("grant", "message"),
    [
        (
            pool_pb2.Grant(user="a", group="b", permission=pool_pb2.PERMISSION_VIEW),
            "grants[1]: give exactly one of",
        ),
        (pool_pb2.Grant(permission=pool_pb2.PERMISSION_VIEW), "grants[1]: give exactly one of"),
        (pool_pb2.Grant(user="a"), "grants[1].permission: unknown permission 0"),
        (
            pool_pb2.Grant(user="a", permission=pool_pb2.Permission.ValueType(7)),
            "grants[1].permission: unknown permission 7",
        ),
    ],
)
def test_bad_grants_are_invalid_arguments_naming_them(grant: pool_pb2.Grant, message: str) -> None:
    good = pool_pb2.Grant(user="x", permission=pool_pb2.PERMISSION_VIEW)
    with pytest.raises(InvalidArgument) as info:
        config_from_pb(_spec_with(good, grant))
    assert str(info.value).startswith(message)


def test_grant_names_are_validated_with_the_pool() -> None:
    with pytest.raises(InvalidArgument) as info:
        validate_config(PoolConfig("/a", grants=(user("ok", V), group("two words", V))))
    assert info.value.field == "grants[1].group"


def test_pool_yaml_takes_grants_as_strings_or_mappings() -> None:
    spec = load_pool_spec_yaml(
        "path: /research/vision\n"
        "grants:\n"
        "  - submit=group:vision\n"
        "  - {user: alice, permission: admin}\n"
    )
    assert config_from_pb(spec).grants == (group("vision", S), user("alice", A))
    with pytest.raises(InvalidArgument, match=r"^grants\[0\]\.permission: unknown permission"):
        load_pool_spec_yaml("path: /a\ngrants: [{user: a, permission: own}]\n")
    with pytest.raises(InvalidArgument, match=r"^grants\[1\]: must be PERMISSION="):
        load_pool_spec_yaml("path: /a\ngrants: [view=user:a, 3]\n")


# ---------------------------------------------------------------- job owners in the database


def test_owner_is_stored_and_listing_filters_by_pool_in_the_query(manager: JobManager) -> None:
    mine, _ = manager.create_job(make_spec(pool="/a"), owner="alice")
    assert mine.owner == "alice"
    assert manager.get_job(mine.id).owner == "alice"
    anonymous, _ = manager.create_job(make_spec(pool="/b"))
    assert manager.get_job(anonymous.id).owner == ""
    for i in range(3):
        manager.create_job(make_spec(pool="/c", name=f"c{i}"), owner="bob")

    def listed(pools: frozenset[str] | None, size: int = 100) -> list[str]:
        ids: list[str] = []
        token = ""
        while True:
            page, token = manager.list_jobs(JobFilter(pools=pools), size, token)
            ids += [j.id for j in page]
            if not token:
                return ids

    assert set(listed(frozenset({"/a"}))) == {mine.id}
    assert listed(frozenset()) == []
    # Pages are full pages of visible jobs: the filter is in the query, not after it.
    page, token = manager.list_jobs(JobFilter(pools=frozenset({"/c", "/a"})), 2, "")
    assert len(page) == 2 and token
    assert len(listed(frozenset({"/c", "/a"}), size=2)) == 4
    assert len(listed(None)) == 5


def test_a_request_id_is_the_callers_own(manager: JobManager) -> None:
    job, created = manager.create_job(make_spec(), "req-1", owner="alice")
    again, created_again = manager.create_job(make_spec(), "req-1", owner="alice")
    assert created and not created_again and again.id == job.id
    with pytest.raises(AlreadyExists, match="used by another caller"):
        manager.create_job(make_spec(), "req-1", owner="bob")


# ---------------------------------------------------------------- migration 0011


@pytest.fixture(params=["sqlite", "postgresql"])
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Engine]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'm.db'}"
    else:
        url = str(request.getfixturevalue("pg_empty_url"))
    eng = make_engine(url)
    yield eng
    eng.dispose()


def _alembic(engine: Engine, action: str, revision: str) -> None:
    from alembic import command

    cfg = migrate.alembic_config()
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        getattr(command, action)(cfg, revision)


def test_0011_adds_an_empty_owner_to_existing_jobs_and_downgrades(engine: Engine) -> None:
    _alembic(engine, "upgrade", "0010")
    created = "2026-01-01 00:00:00" + ("+00" if engine.dialect.name == "postgresql" else "")
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO jobs (id, name, pool, priority, instances, state, goal, reason,"
                " message, spec, task_counts, created_at, updated_at, version) VALUES"
                " ('j1', 'old', '/a', 0, 1, 'PENDING', 'RUN', '', '', :spec, '{}',"
                " :at, :at, 1)"
            ),
            {"spec": b"", "at": created},
        )
    _alembic(engine, "upgrade", "0011")
    with engine.connect() as conn:
        assert conn.execute(text("SELECT owner FROM jobs WHERE id = 'j1'")).scalar_one() == ""
    _alembic(engine, "downgrade", "0010")
    assert "owner" not in {c["name"] for c in inspect(engine).get_columns("jobs")}
    with engine.connect() as conn:
        assert conn.execute(text("SELECT name FROM jobs WHERE id = 'j1'")).scalar_one() == "old"
