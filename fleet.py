"""Script shim for PyInstaller and `python fleet.py ...`: never imported."""

from fleet.cli.main import main

if __name__ == "__main__":
    main()
