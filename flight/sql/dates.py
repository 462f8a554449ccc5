"""Interval arithmetic on date and timestamp columns: months and years, days, and times of day.

DuckDB's rules: a date plus an interval is a TIMESTAMP; a month added to the 31st lands on the last
day of a shorter month (January 31 + 1 month = February 29 in 2020). Arrow has no calendar addition,
so a month shift is the civil-date arithmetic written in the IR: the year and month become a month
count, shifted; the day is kept, or the new month's last day where it has fewer; the result is the
day number again (Howard Hinnant's ``days_from_civil``, for years 0 to 9999). Everything is integer
arithmetic both engines run.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa

from flight.plan.expr import Expr, call, if_else, lit
from flight.sql.errors import unsupported
from flight.sql.rel import Scalars

__all__ = ["DAY_NS", "FUNCTIONS", "add_months", "shifted"]

DAY_NS = 86_400 * 10**9
_I64 = pa.int64()


def _n(v: int) -> Expr:
    return lit(v, _I64)


def _div(a: Expr, b: int) -> Expr:
    """Integer division of a value that is never negative here (truncation is the floor)."""
    return call("divide", a, _n(b))


def _mod(a: Expr, b: int) -> Expr:
    return a - _div(a, b) * _n(b)


def add_months(day: Expr, months: int | Expr) -> Expr:
    """The date ``months`` months after ``day`` (a date32), its day kept or cut to the month's last.

    A negative count goes back; the count may be a column (Spark's ``add_months(d, n)``)."""
    year, month, dom = (call(f, day).cast(_I64) for f in ("year", "month", "day"))
    count = _n(months) if isinstance(months, int) else months.cast(_I64)
    total = year * _n(12) + month - _n(1) + count
    new_year = _div(total, 12)
    new_month = total - new_year * _n(12) + _n(1)
    last = _days_in_month(new_year, new_month)
    new_day = if_else(dom > last, last, dom)
    return _date(new_year, new_month, new_day)


def _days_in_month(year: Expr, month: Expr) -> Expr:
    leap = ((_mod(year, 4) == _n(0)) & (_mod(year, 100) != _n(0))) | (_mod(year, 400) == _n(0))
    short = month.isin(pa.array([4, 6, 9, 11], _I64))
    return if_else(month == _n(2), _n(28) + leap.cast(_I64), if_else(short, _n(30), _n(31)))


def _date(year: Expr, month: Expr, day: Expr) -> Expr:
    return _days_from_civil(year, month, day).cast(pa.int32()).cast(pa.date32())


def last_day(day: Expr) -> Expr:
    """The last day of the month of ``day`` (a date32)."""
    year, month = (call(f, day).cast(_I64) for f in ("year", "month"))
    return _date(year, month, _days_in_month(year, month))


def make_date(year: Expr, month: Expr, day: Expr) -> Expr:
    """The date of a year, month and day; a day the month does not have is an error (DuckDB's and ANSI
    Spark's). Written as ISO text cast to a date, so the engine's own cast checks it."""
    def digits(x: Expr, width: int) -> Expr:
        return call("utf8_lpad", x.cast(_I64).cast(pa.string()), width=width, padding="0")

    text = call("binary_join_element_wise", digits(year, 4), digits(month, 2), digits(day, 2), lit("-"))
    return text.cast(pa.date32())


def _days_from_civil(year: Expr, month: Expr, day: Expr) -> Expr:
    """Days since 1970-01-01 of a civil date (year >= 0)."""
    y = year - (month <= _n(2)).cast(_I64)
    era = _div(y, 400)
    yoe = y - era * _n(400)
    mp = if_else(month > _n(2), month - _n(3), month + _n(9))
    doy = _div(_n(153) * mp + _n(2), 5) + day - _n(1)
    doe = yoe * _n(365) + _div(yoe, 4) - _div(yoe, 100) + doy
    return era * _n(146097) + doe - _n(719468)


def shifted(value: Expr, value_type: pa.DataType, months: int, days: int, nanoseconds: int) -> Expr:
    """``value`` (a date or a timestamp) plus an interval, as DuckDB computes it: a TIMESTAMP (microseconds
    for a date), months first, then days, then the time."""
    unit: pa.DataType
    if pa.types.is_date32(value_type):
        day, time = value, None
        unit = pa.timestamp("us")
    else:
        unit = value_type
        day = value.cast(pa.date32())
        time = call("subtract", value, day.cast(unit))  # the time of day, a duration
    if months:
        day = add_months(day, months)
    if days:
        day = call("add_checked", day.cast(pa.int32()), lit(days, pa.int32())).cast(pa.date32())
    out = day.cast(unit)
    if time is not None:
        out = call("add", out, time)
    if nanoseconds:
        out = call("add", out, lit(nanoseconds // 1000, pa.duration("us")).cast(pa.duration(unit.unit)))  # type: ignore[attr-defined]
    return out


def _as_date(t: Scalars, x: Expr, name: str) -> Expr:
    """A date, or a timestamp's date (both engines' ``last_day`` and ``add_months`` take either)."""
    xt = t.type_of(x)
    if pa.types.is_date32(xt):
        return x
    if pa.types.is_timestamp(xt):
        return x.cast(pa.date32())
    raise unsupported(f"{name}() of a {xt}")


def _add_months_fn(t: Scalars, args: list[Any], e: Any) -> Expr:
    """Spark's ``add_months(date, n)``: a DATE, the day cut to the new month's last where it has fewer."""
    return add_months(_as_date(t, t(args[0]), "add_months"), t(args[1]))


def _last_day_fn(t: Scalars, args: list[Any], e: Any) -> Expr:
    return last_day(_as_date(t, t(args[0]), "last_day"))


def _make_date_fn(t: Scalars, args: list[Any], e: Any) -> Expr:
    return make_date(*(t(a) for a in args))


FUNCTIONS: dict[str, Callable[[Scalars, list[Any], Any], Expr]] = {
    "add_months": _add_months_fn,
    "last_day": _last_day_fn,
    "make_date": _make_date_fn,
}
"""Calendar functions by name (``add_months`` and ``last_day`` are declared in ``flight.sql.library``)."""
