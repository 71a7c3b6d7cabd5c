"""``python -m feiqiu_etl`` — same as the ``feiqiu-etl`` console script."""

from feiqiu_etl.launcher import main

if __name__ == "__main__":  # pragma: no cover
    main()
