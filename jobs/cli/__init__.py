"""The ``gpuyard`` command line: thin typer commands that parse, call one function and print."""
