"""`gpu-alert-bot selftest`: prove on day one that the whole alert path works (bot/selftest/command.py), and
mark its synthetic alert as a test everywhere it goes (bot/selftest_label.py)."""
