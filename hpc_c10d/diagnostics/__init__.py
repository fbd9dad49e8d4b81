"""The debug aids: debug levels and logging, the watchdog, the flight recorder, the ranks'
fingerprints, the roll call, the trace report and ``monitored_barrier``.

They sit just above the core: the transports and the facade use them, never the other way
round (docs/architecture.md, "Hangs").
"""
