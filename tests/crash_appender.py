"""Run by tests in a separate process: append with a broker configured, then die right after
the append commits, before its after-append job is scheduled (a crash at the worst moment).

python -m tests.crash_appender SESSION_ID TEXT [TEXT ...]   # exits with 9 when it crashed there
"""

import os
import sys

import django


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
    django.setup()
    from memory_app import Memory
    from memory_app.memory import ANY_OWNER
    from memory_app.services import background

    def crash(session_id) -> None:  # the receiver calls this once the append has committed
        os._exit(9)

    background.schedule_after_append = crash
    mem = Memory.get(sys.argv[1], owner=ANY_OWNER)
    mem.add_many([{"role": "user", "content": text} for text in sys.argv[2:]])
    sys.exit(0)  # not reached: the append did not schedule anything


if __name__ == "__main__":
    main()
