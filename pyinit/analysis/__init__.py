"""Reading a finished (or running) run's folder: ``timeline`` (where the
seconds went before the first step, and each restart's), ``report`` (the
run's GPU-hours, accounted) and ``report_html`` (its page of charts). It
reads the records ``pyinit.runlog`` defines and launches nothing."""
