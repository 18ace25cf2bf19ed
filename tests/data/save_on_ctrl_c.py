"""A rank that saves its state when interrupted (Ctrl-C's KeyboardInterrupt),
which takes a moment, then ends."""

import time

print("ready", flush=True)
try:
    while True:
        time.sleep(0.05)
except KeyboardInterrupt:
    print("interrupted: saving", flush=True)
    time.sleep(1.0)
    print("saved", flush=True)
