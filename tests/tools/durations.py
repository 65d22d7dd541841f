"""Write ``tests/durations.txt`` from a JUnit report: seconds per test file, heaviest first.

``make test`` hands whole files to its test processes (``--dist loadfile``) in the order that
``tests/conftest.py`` gives them: the heaviest first, as this table says, so that no long file
starts last while the other process has nothing left to do. Refresh it after a suite's shape
changes::

    make test PYTEST_ARGS=--junitxml=/tmp/junit.xml
    python tests/tools/durations.py /tmp/junit.xml
"""

import collections
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

TABLE = Path(__file__).resolve().parent.parent / "durations.txt"


def file_seconds(junit: Path) -> dict[str, float]:
    """Seconds per test file (``tests/x/test_y.py``), set-up and tear-down included."""
    seconds: collections.Counter[str] = collections.Counter()
    for case in ET.parse(junit).getroot().iter("testcase"):
        module = case.get("classname", "")
        if module:
            seconds["/".join(module.split(".")) + ".py"] += float(case.get("time", 0))
    return dict(seconds)


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not Path(argv[0]).is_file():
        print("usage: python tests/tools/durations.py JUNIT.xml", file=sys.stderr)
        return 2
    rows = sorted(file_seconds(Path(argv[0])).items(), key=lambda row: (-row[1], row[0]))
    TABLE.write_text("# seconds per test file (tests/tools/durations.py), heaviest first\n"
                     + "".join(f"{s:.0f} {name}\n" for name, s in rows if s >= 1))
    print(f"wrote {TABLE} ({len(rows)} files)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
