"""Run by tests in separate processes: append to one session, print the cursors it got.

python -m tests.append_worker SESSION_ID COUNT [BATCH]
"""

import json
import os
import sys

import django


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")
    django.setup()
    from memory_app import Memory
    from memory_app.memory import ANY_OWNER

    session_id, count = sys.argv[1], int(sys.argv[2])
    batch = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    mem = Memory.get(session_id, owner=ANY_OWNER)
    cursors = []
    pid = os.getpid()
    for i in range(0, count, batch):
        n = min(batch, count - i)
        messages = [{"role": "user", "content": f"{pid}:{i + j}"} for j in range(n)]
        if n == 1:
            cursors.append(mem.add(messages[0]).cursor)
        else:
            cursors.extend(m.cursor for m in mem.add_many(messages))
    print(json.dumps(cursors))


if __name__ == "__main__":
    main()
