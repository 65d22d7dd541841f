"""CloudWatch Logs over the jobs' stored log lines: one group, one stream per job attempt.

Group ``/aws/batch/job``; streams are named as ``shapes`` says. A line's ``timestamp`` and
``ingestionTime`` are when the service stored it. GetLogEvents' tokens are ``f/<seq>`` (lines
after it) and ``b/<seq>`` (lines before it); at the end of a stream the forward token it was
given comes back, which is where pollers stop. FilterLogEvents' ``filterPattern`` is a list of
terms (a term in double quotes may hold spaces), each of which must occur in the message.
"""

from __future__ import annotations

import re
from typing import Any

from dyntrain.service.aws import shapes
from dyntrain.service.aws.context import Context, Handler
from dyntrain.service.aws.errors import invalid_parameter, not_found
from dyntrain.service.aws.shapes import LOG_GROUP, ms, page, page_offset, page_token
from dyntrain.service.core.records import LogLine, LogStream

MAX_EVENTS = 10_000
MAX_STREAMS = 50
_TOKEN = re.compile(r"^([fb])/(\d+)$")
_TERM = re.compile(r'"([^"]*)"|(\S+)')


def _group(p: dict) -> None:
    group = p.get("logGroupName") or p.get("logGroupIdentifier") or ""
    if group.rsplit(":log-group:", 1)[-1] != LOG_GROUP:
        raise not_found(f"The specified log group does not exist: {group!r} (dyntrain keeps "
                        f"job logs in {LOG_GROUP})")


def _stream(ctx: Context, name: str) -> LogStream:
    key = shapes.parse_stream(name)
    found = [] if key is None else [
        s for s in ctx.ops.logs.streams(job_ids=[key[0]]) if s.attempt_no == key[1]]
    if not found or name not in shapes.stream_names(found[0]):
        raise not_found(f"The specified log stream does not exist: {name!r}")
    return found[0]


def _limit(p: dict, most: int) -> int:
    n = p.get("limit") or most
    if not 1 <= n <= most:
        raise invalid_parameter(f"limit must be 1-{most}, got {n}")
    return n


def _times(p: dict) -> tuple[float | None, float | None]:
    start, end = p.get("startTime"), p.get("endTime")
    return (None if start is None else start / 1000, None if end is None else end / 1000)


def _event(line: LogLine) -> dict[str, Any]:
    return {"timestamp": ms(line.at), "message": line.line, "ingestionTime": ms(line.at)}


def get_log_events(ctx: Context, p: dict) -> dict[str, Any]:
    _group(p)
    s = _stream(ctx, p["logStreamName"])
    limit = _limit(p, MAX_EVENTS)
    start, end = _times(p)
    token = p.get("nextToken")
    args: dict[str, Any] = {"start_at": start, "end_at": end, "limit": limit}
    if token:
        m = _TOKEN.match(token)
        if m is None:
            raise invalid_parameter(f"invalid nextToken {token[:80]!r}: pass "
                                    "nextForwardToken or nextBackwardToken")
        forward, seq = m.group(1) == "f", int(m.group(2))
        args.update(after_seq=seq) if forward else args.update(before_seq=seq, newest=True)
    else:
        forward, seq = bool(p.get("startFromHead")), 0
        args["newest"] = not forward
    # read under the lock (``Logs.attempt``): a job DescribeJobs showed as ended has had its
    # workers' last lines copied
    lines = ctx.ops.logs.attempt(s.job_id, s.attempt_no, **args)
    if lines:
        after, before = lines[-1].seq, lines[0].seq
    elif token:
        after = before = seq  # nothing further that way: the same token comes back
    else:
        after, before = 0, 1
    return {"events": [_event(x) for x in lines], "nextForwardToken": f"f/{after}",
            "nextBackwardToken": f"b/{before}"}


def _stream_view(s: LogStream, arns: shapes.Arns) -> dict[str, Any]:
    name = shapes.stream_names(s)[0]
    return shapes.drop_none({
        "logStreamName": name, "creationTime": ms(s.created_at),
        "firstEventTimestamp": ms(s.first_at), "lastEventTimestamp": ms(s.last_at),
        "lastIngestionTime": ms(s.last_at), "storedBytes": s.stored_bytes,
        "arn": f"{arns.log_group()}:log-stream:{name}"})


def _streams_with_prefix(ctx: Context, prefix: str | None) -> list[LogStream]:
    """Streams whose name or 2017-style name starts with ``prefix``; the job id part of the
    prefix narrows the query first."""
    narrow: dict[str, Any] = {}
    if prefix and "/" in prefix:
        task = prefix.rsplit("/", 1)[1].split(".", 1)[0]
        if task:
            narrow["job_id_prefix"] = task
    found = ctx.ops.logs.streams(**narrow)
    if not prefix:
        return found
    return [s for s in found if any(n.startswith(prefix) for n in shapes.stream_names(s))]


def describe_log_streams(ctx: Context, p: dict) -> dict[str, Any]:
    _group(p)
    prefix, order = p.get("logStreamNamePrefix"), p.get("orderBy") or "LogStreamName"
    if prefix and order == "LastEventTime":
        raise invalid_parameter("Cannot order by LastEventTime with a logStreamNamePrefix.")
    streams = [_stream_view(s, ctx.arns) for s in _streams_with_prefix(ctx, prefix)]
    if order == "LastEventTime":
        streams.sort(key=lambda v: v.get("lastEventTimestamp", 0),
                     reverse=bool(p.get("descending")))
    else:
        streams.sort(key=lambda v: v["logStreamName"], reverse=bool(p.get("descending")))
    return page(streams, page_offset(p.get("nextToken"), invalid_parameter),
                _limit(p, MAX_STREAMS), "logStreams")


def filter_log_events(ctx: Context, p: dict) -> dict[str, Any]:
    """Events of the named streams (or of those with the prefix, or all), interleaved by
    time; ``eventId`` is ``<task>/<seq>``."""
    _group(p)
    names, prefix = p.get("logStreamNames"), p.get("logStreamNamePrefix")
    if names and prefix:
        raise invalid_parameter("give logStreamNames or logStreamNamePrefix, not both")
    streams = ([_stream(ctx, n) for n in names] if names
               else _streams_with_prefix(ctx, prefix))
    by_key = {(s.job_id, s.attempt_no): s for s in streams}
    terms = [a or b for a, b in _TERM.findall(p.get("filterPattern") or "")]
    start, end = _times(p)
    limit = _limit(p, MAX_EVENTS)
    offset = page_offset(p.get("nextToken"), invalid_parameter)
    found = ctx.ops.logs.search(  # as GetLogEvents: an ended job's last lines are there
        None if not (names or prefix) else list(by_key), start_at=start, end_at=end,
        terms=terms, offset=offset, limit=limit + 1)
    events = []
    for job_id, line in found[:limit]:
        s = by_key[(job_id, line.attempt_no)]  # every stream with lines is in by_key
        events.append({"logStreamName": shapes.stream_names(s)[0], **_event(line),
                       "eventId": f"{shapes.task_of(job_id, line.attempt_no)}/{line.seq}"})
    out: dict[str, Any] = {"events": events, "searchedLogStreams": [
        {"logStreamName": shapes.stream_names(s)[0], "searchedCompletely": True}
        for s in by_key.values()]}
    if len(found) > limit:
        out["nextToken"] = page_token(offset + limit)
    return out


def describe_log_groups(ctx: Context, p: dict) -> dict[str, Any]:
    prefix = p.get("logGroupNamePrefix") or ""
    pattern = p.get("logGroupNamePattern") or ""
    groups = []
    if LOG_GROUP.startswith(prefix) and pattern.lower() in LOG_GROUP.lower():
        groups.append({"logGroupName": LOG_GROUP, "creationTime": 0, "storedBytes": 0,
                       "arn": f"{ctx.arns.log_group()}:*", "logGroupArn": ctx.arns.log_group(),
                       "logGroupClass": "STANDARD", "metricFilterCount": 0})
    return page(groups, page_offset(p.get("nextToken"), invalid_parameter),
                _limit(p, MAX_STREAMS), "logGroups")


OPERATIONS: dict[str, Handler] = {
    "GetLogEvents": get_log_events,
    "FilterLogEvents": filter_log_events,
    "DescribeLogStreams": describe_log_streams,
    "DescribeLogGroups": describe_log_groups,
}
