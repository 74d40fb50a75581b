"""Standard 5-field cron expressions, parsed the way Kubernetes' CronJob does.

kube-apiserver validates `CronJob.spec.schedule` with robfig/cron's
`ParseStandard`: five fields (minute hour day-of-month month day-of-week),
each a comma list of `*`, `?`, `N`, `A-B`, with an optional `/STEP`; month
and weekday names (`jan`, `mon`); and the descriptors `@yearly`,
`@annually`, `@monthly`, `@weekly`, `@daily`, `@midnight`, `@hourly` and
`@every <duration>`.  The error texts are robfig's, which is what kubectl
users see.  The parsed `CronSchedule` keeps the allowed values of each field
and computes run times (`next_after`) the way robfig's `Next` does, for the
CronJob controller.
"""

from __future__ import annotations

import datetime as _dt
import re
from dataclasses import dataclass


class CronError(ValueError):
    pass


@dataclass(frozen=True)
class _Bounds:
    low: int
    high: int
    names: dict[str, int]


_MONTHS = {m: i + 1 for i, m in enumerate(
    ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"))}
_DOWS = {d: i for i, d in enumerate(("sun", "mon", "tue", "wed", "thu", "fri", "sat"))}
_FIELDS = (
    _Bounds(0, 59, {}),
    _Bounds(0, 23, {}),
    _Bounds(1, 31, {}),
    _Bounds(1, 12, _MONTHS),
    _Bounds(0, 6, _DOWS),
)
_DESCRIPTORS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_DURATION_RE = re.compile(r"(?:[0-9]+(?:\.[0-9]+)?(?:ns|us|µs|ms|s|m|h))+")
_DURATION_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ns|us|µs|ms|s|m|h)")
_UNIT_SECONDS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1, "m": 60, "h": 3600}


@dataclass(frozen=True)
class CronSchedule:
    """Allowed values per field; `every` (seconds) is set instead for `@every`."""

    minutes: frozenset[int] = frozenset()
    hours: frozenset[int] = frozenset()
    days_of_month: frozenset[int] = frozenset()
    months: frozenset[int] = frozenset()
    days_of_week: frozenset[int] = frozenset()
    # Cron's quirk: when both day fields are restricted, a day matches if
    # *either* does; when one is `*`, only the other counts.
    dom_star: bool = False
    dow_star: bool = False
    every: float | None = None

    def day_matches(self, day: _dt.date) -> bool:
        dom = day.day in self.days_of_month
        dow = (day.isoweekday() % 7) in self.days_of_week  # cron counts Sunday as 0
        if self.dom_star or self.dow_star:
            return dom and dow
        return dom or dow

    def next_after(self, t: _dt.datetime, tz: _dt.tzinfo) -> _dt.datetime | None:
        """The first run time strictly after `t` (aware), as an aware time in `tz`.

        Fields are matched on the wall clock of `tz`, as robfig/cron does with a
        location.  A wall time that does not exist (skipped by a daylight-saving
        change) is skipped; an ambiguous one runs at its first occurrence after `t`.
        None when nothing matches within five years (say, February 31st)."""
        if self.every is not None:
            # robfig's ConstantDelaySchedule: whole seconds, then the delay.
            return (t.replace(microsecond=0) + _dt.timedelta(seconds=self.every)).astimezone(tz)
        local = t.astimezone(tz).replace(tzinfo=None, second=0, microsecond=0) + _dt.timedelta(minutes=1)
        limit = local.year + 5
        while local.year <= limit:
            if local.month not in self.months:
                local = (local.replace(day=1, hour=0, minute=0) + _dt.timedelta(days=32)).replace(day=1)
            elif not self.day_matches(local.date()):
                local = local.replace(hour=0, minute=0) + _dt.timedelta(days=1)
            elif local.hour not in self.hours:
                local = local.replace(minute=0) + _dt.timedelta(hours=1)
            elif local.minute not in self.minutes:
                local += _dt.timedelta(minutes=1)
            else:
                for fold in (0, 1):
                    aware = local.replace(tzinfo=tz, fold=fold)
                    if aware.astimezone(_dt.UTC).astimezone(tz).replace(tzinfo=None) != local:
                        break  # in a daylight-saving gap: this wall time never happens
                    if aware > t:
                        return aware
                local += _dt.timedelta(minutes=1)
        return None


def _number(s: str, bounds: _Bounds) -> int:
    low = s.lower()
    if low in bounds.names:
        return bounds.names[low]
    if not s.isdigit():
        raise CronError(f"failed to parse int from {s}: strconv.Atoi: parsing {s!r}: invalid syntax")
    return int(s)


def _parse_range(expr: str, bounds: _Bounds) -> set[int]:
    range_and_step = expr.split("/")
    if len(range_and_step) > 2:
        raise CronError(f"too many slashes: {expr}")
    low_high = range_and_step[0].split("-")
    if len(low_high) > 2:
        raise CronError(f"too many hyphens: {expr}")
    star = low_high[0] in ("*", "?")
    if star:
        if len(low_high) > 1:
            raise CronError(f"too many hyphens: {expr}")
        start, end = bounds.low, bounds.high
    else:
        start = _number(low_high[0], bounds)
        end = _number(low_high[1], bounds) if len(low_high) == 2 else start
    step = 1
    if len(range_and_step) == 2:
        step = _number(range_and_step[1], _Bounds(0, 0, {}))
        # "N/step" means "from N to the end of the field".
        if not star and len(low_high) == 1:
            end = bounds.high
    if start < bounds.low:
        raise CronError(f"beginning of range ({start}) below minimum ({bounds.low}): {expr}")
    if end > bounds.high:
        raise CronError(f"end of range ({end}) above maximum ({bounds.high}): {expr}")
    if start > end:
        raise CronError(f"beginning of range ({start}) beyond end of range ({end}): {expr}")
    if step == 0:
        raise CronError(f"step of range should be a positive number: {expr}")
    return set(range(start, end + 1, step))


def _parse_field(field: str, bounds: _Bounds) -> frozenset[int]:
    values: set[int] = set()
    for part in field.split(","):
        values |= _parse_range(part, bounds)
    return frozenset(values)


def parse_cron(spec: str) -> CronSchedule:
    """Parse a schedule or raise `CronError` with robfig/cron's message."""
    if not isinstance(spec, str) or not spec.strip():
        raise CronError("empty spec string")
    spec = spec.strip()
    if spec.startswith("@"):
        if spec.startswith("@every "):
            dur = spec[len("@every "):].strip()
            if not _DURATION_RE.fullmatch(dur):
                raise CronError(f"failed to parse duration {spec}: time: invalid duration {dur!r}")
            seconds = sum(float(n) * _UNIT_SECONDS[u] for n, u in _DURATION_PART.findall(dur))
            # robfig rounds @every down to whole seconds, with a 1s minimum.
            return CronSchedule(every=max(1.0, float(int(seconds))))
        if spec not in _DESCRIPTORS:
            raise CronError(f"unrecognized descriptor: {spec}")
        spec = _DESCRIPTORS[spec]
    fields = spec.split()
    if len(fields) != 5:
        raise CronError(f"expected exactly 5 fields, found {len(fields)}: [{' '.join(fields)}]")
    parsed = [_parse_field(f, b) for f, b in zip(fields, _FIELDS, strict=True)]
    return CronSchedule(
        minutes=parsed[0], hours=parsed[1], days_of_month=parsed[2], months=parsed[3],
        days_of_week=parsed[4],
        dom_star=_is_star(fields[2]), dow_star=_is_star(fields[4]),
    )


def _is_star(field: str) -> bool:
    """robfig's "star bit": some part of the field is `*` or `?` with no step
    above 1 (`*/1` counts, `*/2` does not) — it decides how the day fields combine."""
    for part in field.split(","):
        base, _, step = part.partition("/")
        if base in ("*", "?") and step in ("", "1"):
            return True
    return False
