"""The incident: many alerts with one cause, told once by every receiver.

`model.py` is what every sink renders (`IncidentView`, carried by a message whose event is "incident").
"""
