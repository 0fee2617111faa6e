"""The operator's commands beside `serve`: their argument handling and printing (bot/cli.py dispatches)."""
