"""The read-only incident and alert pages the bot serves under /pages/ (docs/pages.md): `bot.pages.routes` adds
them to the bot's application; `bot.pages.links` makes the links every message carries to them. Importing this
package alone costs nothing (the worker process stamps links without loading the templates)."""
