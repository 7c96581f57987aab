"""`python -m gpufed.cli`: the same as the `gpufed` console script."""

from gpufed.cli import main

main()
