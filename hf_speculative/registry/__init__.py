"""The offline model registry and the integrity checks of what it and the shipped drafters hold."""
