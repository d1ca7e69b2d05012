"""GitHub: webhook app, event → request, queue, PyGithub client, commands, publishing, report rendering."""
