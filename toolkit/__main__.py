from edgeopt.cli import entry

entry()
