"""`python -m proxy` runs the same CLI as `compactd`."""

from proxy.cli.main import main

if __name__ == "__main__":
    raise SystemExit(main())
