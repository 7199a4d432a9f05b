"""Diagnostics: the flight recorder, the watchdog, failure reports, dumps and their analyzer.

They see the core only through :mod:`pycoll.hooks` (the views and the observer protocol).
"""

from .recorder import FlightRecorder, get_recorder
from .watchdog import Watchdog, dump_flight_recorder, enable_dump_signal, get_watchdog, install

__all__ = ["FlightRecorder", "Watchdog", "get_recorder", "get_watchdog", "dump_flight_recorder",
           "enable_dump_signal", "install"]
