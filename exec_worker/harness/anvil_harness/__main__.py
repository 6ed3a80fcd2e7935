"""python -m anvil_harness CMD_FD REPLY_FD: serve the C worker (see server.py)."""
import sys

from anvil_harness import server

if __name__ == "__main__":
    sys.exit(server.main(sys.argv[1:]))
