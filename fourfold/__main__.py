"""``python -m fourfold``: the same command line as the ``fourfold`` script (:func:`fourfold.cli.main`)."""

from fourfold.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
