"""`python -m imagegen.config --markdown`: the settings reference of docs/configuration.md;
`--assignments`: the block of imagegen/settings.py that names the object's values."""

import sys

from imagegen.config.reference import assignments, markdown

if sys.argv[1:] == ["--markdown"]:
    sys.stdout.write(markdown())
elif sys.argv[1:] == ["--assignments"]:
    sys.stdout.write(assignments())
else:
    sys.exit("usage: python -m imagegen.config --markdown | --assignments")
