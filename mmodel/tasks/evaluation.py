"""Celery tasks of MModel's evaluation: none of its own. An evaluation run is an AIStation
job, scheduled, watched and reconciled by AIStation's tasks; its results arrive through the
runner's events (`mmodel.services.evaluation_events`)."""
