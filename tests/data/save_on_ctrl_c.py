"""A rank that saves its state when interrupted (Ctrl-C's KeyboardInterrupt),
which takes a moment, then ends."""

import time

try:
    print("ready", flush=True)  # inside: Ctrl-C may come as soon as it is read
    while True:
        time.sleep(0.05)
except KeyboardInterrupt:
    print("interrupted: saving", flush=True)
    time.sleep(1.0)
    print("saved", flush=True)
