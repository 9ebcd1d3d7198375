"""Test-wide settings: a private zoo cache per session, float32 everywhere."""

import os
import tempfile

# Zoo models trained by tests go to a throwaway cache unless the caller chose one.
os.environ.setdefault("LAB_CACHE", tempfile.mkdtemp(prefix="lab-test-cache-"))
