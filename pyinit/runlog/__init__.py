"""A run's records, in the formats both sides share: ``pyinit run``, its
agent and its workers write them (``pyinit.run``), and ``pyinit report`` and
``pyinit timeline`` read them (``pyinit.analysis``): the event log
(``events``), each rank's step records (``steps``) and its progress file,
which the stall watch reads (``progress``)."""
