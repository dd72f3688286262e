"""The chaos and bad-input suite (issue 12): faults injected repeatedly at seeded random moments.

One knob sets the size: ``MSGSTREAM_CHAOS_SIZE`` = ``small`` (default, inside ``make test``),
``medium`` or ``large`` (``make chaos``). ``MSGSTREAM_CHAOS_SEED`` replays a run;
``MSGSTREAM_CHAOS_RESULTS`` is where each fault's figures are written as JSON.
"""
