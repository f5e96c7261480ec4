"""The command line: thin wrappers that parse options, call the library, and map its
frozen results and errors to output and exit codes."""
