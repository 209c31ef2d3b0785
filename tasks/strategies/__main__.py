import sys

from tasks.strategies import main

main(sys.argv[1:])
