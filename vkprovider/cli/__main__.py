"""`python -m vkprovider.cli`: the same as the `gpufed` console script."""

from vkprovider.cli import main

main()
