"""Checks every request at the API edge, before a servicer sees it: no string holds a NUL or
invalid UTF-8, no string or repeated field is longer than its limit, and no unsigned 64-bit
number exceeds what the database stores (README, "Limits").

The walk is generic over the message's descriptor, so a field added to a proto is checked
without code here; the tables below only name the fields whose limit differs from the default.
Job specs get their own, finer checks in :mod:`peloton.core.spec` after these.
"""

from __future__ import annotations

import functools
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.descriptor import FieldDescriptor, FileDescriptor
from google.protobuf.message import DecodeError, Message

from peloton.core import spec
from peloton.errors import InvalidArgument

# KillJob's and RestartJob's message is stored once (the job, its event, one shared copy the
# tasks name) but shown with every task's attempt and event: 1 KiB keeps a page of 1,000 tasks
# (ListTasks' default) near 1 MB.
MAX_MESSAGE = 1024
MAX_JOB_ID = 128
MAX_REQUEST_ID = 128
MAX_PAGE_TOKEN = 256
MAX_HOSTNAME = 255
# ListJobs' label filters: each is one more join on the labels; 16 answer in tens of ms.
MAX_LABEL_FILTERS = 16
MAX_STATES = 16
# Any other string (constraint values, port names, pool owners, ...), in UTF-8 bytes.
DEFAULT_MAX_STRING = 1024
# Any other repeated or map field.
DEFAULT_MAX_REPEATED = 256
# The largest value of an unsigned 64-bit field: PostgreSQL's and SQLite's integers are signed.
MAX_INT64 = 2**63 - 1
_UNSIGNED_64 = (FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_FIXED64)

_V1 = "peloton.v1."
# Longest value, in UTF-8 bytes, of a string field (map keys and values by their entry's field).
STRING_LIMITS: dict[str, int] = {
    **{f"{_V1}{m}.message": MAX_MESSAGE for m in ("KillJobRequest", "RestartJobRequest")},
    **{
        f"{_V1}{m}.job_id": MAX_JOB_ID
        for m in (
            "GetJobRequest",
            "KillJobRequest",
            "RestartJobRequest",
            "DeleteJobRequest",
            "GetTaskRequest",
            "ListTasksRequest",
            "WatchJobRequest",
            "GetTaskLogsRequest",
            "GetTaskGpusRequest",
        )
    },
    **{
        f"{_V1}{m}.hostname": MAX_HOSTNAME
        for m in ("GetHostRequest", "DrainHostRequest", "UndrainHostRequest")
    },
    **{f"{_V1}{m}.path": spec.MAX_POOL_PATH for m in ("DeletePoolRequest", "GetPoolRequest")},
    f"{_V1}CreateJobRequest.request_id": MAX_REQUEST_ID,
    f"{_V1}ListJobsRequest.pool": spec.MAX_POOL_PATH,
    f"{_V1}ListJobsRequest.name_prefix": spec.MAX_NAME,
    f"{_V1}ListJobsRequest.LabelsEntry.key": spec.MAX_LABEL_KEY,
    f"{_V1}ListJobsRequest.LabelsEntry.value": spec.MAX_LABEL_VALUE,
    f"{_V1}ListJobsRequest.page_token": MAX_PAGE_TOKEN,
    f"{_V1}ListTasksRequest.page_token": MAX_PAGE_TOKEN,
    f"{_V1}JobSpec.pool": spec.MAX_POOL_PATH,
    f"{_V1}TaskSpec.command": spec.MAX_COMMAND,
    f"{_V1}TaskSpec.EnvEntry.value": spec.MAX_ENV_VALUE,
    f"{_V1}PoolSpec.path": spec.MAX_POOL_PATH,
}
# Most items of a repeated or map field.
REPEATED_LIMITS: dict[str, int] = {
    f"{_V1}ListJobsRequest.labels": MAX_LABEL_FILTERS,
    f"{_V1}ListJobsRequest.states": MAX_STATES,
    f"{_V1}ListTasksRequest.states": MAX_STATES,
    f"{_V1}ListHostsRequest.states": MAX_STATES,
}


def check_request(request: Message) -> None:
    """Raise InvalidArgument naming the first string or repeated field that breaks a rule."""
    _check_message(request, "")


def check_malformed(message_class: type[Message] | None, data: bytes) -> InvalidArgument:
    """The error for request bytes the message class could not parse: the string field that is
    not valid UTF-8 where that is why, else the request as a whole."""
    if message_class is not None:
        try:
            field = _invalid_utf8_field(message_class.DESCRIPTOR, data)
        except DecodeError:
            field = None
        if field is not None:
            return InvalidArgument(field, "is not valid UTF-8")
    return InvalidArgument("request", "is not a valid protobuf message for this method")


def _check_message(message: Message, prefix: str) -> None:
    for field, value in message.ListFields():
        path = f"{prefix}{field.name}"
        if _is_map(field):
            _check_count(field, path, value)
            entry: Any = field.message_type
            key_field, value_field = entry.fields
            for key, item in value.items():
                _check_scalar(key_field, f"{path} (a key)", key)
                _check_value(value_field, f"{path}[{key!r}]", item)
        elif field.is_repeated:
            _check_count(field, path, value)
            for i, item in enumerate(value):
                _check_value(field, f"{path}[{i}]", item)
        else:
            _check_value(field, path, value)


def _check_value(field: FieldDescriptor, path: str, value: Any) -> None:
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        _check_message(value, f"{path}.")
    else:
        _check_scalar(field, path, value)


def _check_scalar(field: FieldDescriptor, path: str, value: Any) -> None:
    if field.type in _UNSIGNED_64:
        # Stored as the databases' signed 64-bit integers (a sequence, a step, a seed).
        if value > MAX_INT64:
            raise InvalidArgument(path, f"is more than {MAX_INT64}")
        return
    if field.type != FieldDescriptor.TYPE_STRING:
        return
    if "\x00" in value:
        raise InvalidArgument(path, "contains a NUL character")
    limit = STRING_LIMITS.get(field.full_name, DEFAULT_MAX_STRING)
    # A lone surrogate (from a JSON client, say) cannot be stored: it is not valid UTF-8.
    try:
        size = len(value.encode())
    except UnicodeEncodeError:
        raise InvalidArgument(path, "is not valid UTF-8") from None
    if size > limit:
        raise InvalidArgument(path, f"is longer than {limit} bytes (got {size})")


def _check_count(field: FieldDescriptor, path: str, value: Any) -> None:
    limit = REPEATED_LIMITS.get(field.full_name, DEFAULT_MAX_REPEATED)
    if len(value) > limit:
        raise InvalidArgument(path, f"has more than {limit} items (got {len(value)})")


def _is_map(field: FieldDescriptor) -> bool:
    return field.message_type is not None and field.message_type.GetOptions().map_entry


# ---------------------------------------------------------------------------- invalid UTF-8


def _invalid_utf8_field(descriptor: Any, data: bytes) -> str | None:
    """The path of the first string field of ``data`` that is not valid UTF-8 (None: none is).

    protobuf refuses such bytes without saying where; parsed as the message's twin whose
    strings are bytes (the same wire format), every string can be looked at."""
    twin = _bytes_twin(descriptor)()
    twin.ParseFromString(data)
    return _find_bad_utf8(twin, descriptor, "")


def _find_bad_utf8(twin: Message, original: Any, prefix: str) -> str | None:
    for field, value in twin.ListFields():
        path = f"{prefix}{field.name}"
        kind = original.fields_by_name[field.name]
        items = value if field.is_repeated else [value]
        for i, item in enumerate(items):
            where = f"{path}[{i}]" if field.is_repeated else path
            if kind.type == FieldDescriptor.TYPE_MESSAGE:
                found = _find_bad_utf8(item, kind.message_type, f"{where}.")
                if found is not None:
                    return found
            elif kind.type == FieldDescriptor.TYPE_STRING and not _is_utf8(item):
                return where
    return None


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode()
    except UnicodeDecodeError:
        return False
    return True


@functools.cache
def _bytes_twin(descriptor: Any) -> type[Message]:
    """A message class like ``descriptor``'s in its own pool, whose strings are bytes and whose
    maps are repeated key/value messages (a bytes map key is not allowed; the wire is alike)."""
    pool = descriptor_pool.DescriptorPool()
    _add_twin_file(pool, descriptor.file)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(descriptor.full_name))


def _add_twin_file(pool: descriptor_pool.DescriptorPool, file: FileDescriptor) -> None:
    try:
        pool.FindFileByName(file.name)
        return
    except KeyError:
        pass
    for dependency in file.dependencies:
        _add_twin_file(pool, dependency)
    proto = descriptor_pb2.FileDescriptorProto()
    file.CopyToProto(proto)
    for message in proto.message_type:
        _strings_to_bytes(message)
    pool.Add(proto)


def _strings_to_bytes(message: descriptor_pb2.DescriptorProto) -> None:
    message.options.ClearField("map_entry")
    for field in message.field:
        if field.type == descriptor_pb2.FieldDescriptorProto.TYPE_STRING:
            field.type = descriptor_pb2.FieldDescriptorProto.TYPE_BYTES
    for nested in message.nested_type:
        _strings_to_bytes(nested)
