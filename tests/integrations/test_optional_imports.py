"""The core never imports the optional frameworks: they load only with their integration."""

import subprocess
import sys

from tests.integrations.conftest import ROOT


def test_core_and_conversation_load_without_the_frameworks():
    code = (
        "import os, sys\n"
        "os.environ['DJANGO_SETTINGS_MODULE'] = 'project.settings'\n"
        "os.environ['DATABASE_URL'] = 'sqlite:///:memory:'\n"
        "import django; django.setup()\n"
        "import memory_app.memory, memory_app.conversation, memory_app.integrations\n"
        "loaded = [m for m in ('agents', 'langchain_core') if m in sys.modules]\n"
        "assert not loaded, loaded\n"
        "import memory_app.integrations.langchain\n"
        "assert 'langchain_core' in sys.modules and 'agents' not in sys.modules\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
