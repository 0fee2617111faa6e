"""What the bot asks of its store, below every stage that asks it: the Store interface (interface.py) and the
records its methods return (entries.py). bot/store/ implements it on SQLite and PostgreSQL."""
