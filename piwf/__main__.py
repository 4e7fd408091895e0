"""``python -m piwf``: the same command line as the ``piwf`` script."""

from piwf.cli import main

if __name__ == "__main__":
    main()
