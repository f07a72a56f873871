"""gRPC servicers: validate, call a component, map errors to status codes."""
