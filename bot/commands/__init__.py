"""The operator's commands beside `serve`: their argument handling and printing (bot/commands/cli.py dispatches)."""
