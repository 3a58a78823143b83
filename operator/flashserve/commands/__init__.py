"""Small `flashserve` subcommands that work offline."""
