from django.apps import apps
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError


class Command(BaseCommand):
    help = (
        "Seed the demo data of every layer (idempotent). Each app that has demo data gives its "
        "AppConfig a seed_demo(stdout=) method; apps run lowest layer first."
    )

    def handle(self, *args, **options):
        self.stdout.write("Seeding demo data (credentials of new accounts are shown only now):")
        for config in apps.get_app_configs():
            seed = getattr(config, "seed_demo", None)
            if callable(seed):
                try:
                    seed(stdout=self.stdout)
                except ValidationError as exc:
                    raise CommandError(f"{config.label}: {'; '.join(exc.messages)}") from None
        self.stdout.write("Demo data ready.")
