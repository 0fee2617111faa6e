import sys

from bot.commands.cli import main

sys.exit(main())
