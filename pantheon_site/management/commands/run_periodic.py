"""manage.py run_periodic [NAME ...]: run the periodic work now, in this process, once: every entry of
CELERY_BEAT_SCHEDULE, or the ones named (docs/periodic.md). For a deployment without beat, or an operator who wants
a prune now rather than at the next interval; each task audits what it changes, as under beat."""

from django.conf import settings
from django.core.management.base import CommandError

from pantheon_site.celery import app
from pantheon_site.management.base import CommandResult, PantheonCommand


class Command(PantheonCommand):
    help = "Run the periodic tasks (all of CELERY_BEAT_SCHEDULE, or those named) once, now."
    operation = "periodic_run"

    def add_arguments(self, parser):
        parser.add_argument("names", nargs="*", help=f"schedule entries: {', '.join(settings.CELERY_BEAT_SCHEDULE)}")

    def perform(self, *, names, **options) -> CommandResult:
        schedule = settings.CELERY_BEAT_SCHEDULE
        unknown = [name for name in names if name not in schedule]
        if unknown:
            raise CommandError(f"no periodic task {', '.join(unknown)}; the schedule has {', '.join(schedule)}")
        app.loader.import_default_modules()  # the apps' tasks and periodic modules, as a Celery worker loads them
        chosen = names or list(schedule)
        missing = [schedule[name]["task"] for name in chosen if schedule[name]["task"] not in app.tasks]
        if missing:
            raise CommandError(f"the schedule names tasks no app defines: {', '.join(missing)}")
        done = {name: app.tasks[schedule[name]["task"]]() for name in chosen}
        return CommandResult(lines=[f"{name}: {count}" for name, count in done.items()], details={"done": done})
