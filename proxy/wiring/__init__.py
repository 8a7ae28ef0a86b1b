"""One process's wiring: settings -> create_app -> the server."""
