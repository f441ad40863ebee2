"""``python -m slotkit``: see :mod:`slotkit.cli`."""

from __future__ import annotations

from slotkit.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
