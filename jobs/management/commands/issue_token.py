from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand

from jobs.access import tokens


class Command(BaseCommand):
    help = (
        "Create USERNAME if needed and issue a new API token for it (the token is the last line). "
        "Tokens are stored hashed: this is the only time the token is shown."
    )

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--password", help="also set this password, for signing in to the web page")
        parser.add_argument("--staff", action="store_true", help="make the user staff (admin access)")
        parser.add_argument(
            "--moderator", action="store_true",
            help="staff with the review permission (safety.review_content): the admin's review queue",
        )
        parser.add_argument("--rotate", action="store_true", help="revoke the user's other tokens")
        parser.add_argument("--name", default="issue_token", help="a label for the token (shown in the admin)")

    def handle(self, username, password, staff, rotate, name, moderator=False, **options):
        User = get_user_model()
        user, created = User.objects.get_or_create(username=username)
        if password:
            user.set_password(password)
        if staff or moderator:
            user.is_staff = True
        if created or password or staff or moderator:
            user.save()
        if moderator:
            from django.contrib.auth.models import Permission

            user.user_permissions.add(Permission.objects.get(codename="review_content", content_type__app_label="safety"))
        if rotate:
            revoked = tokens.revoke_all(user)
            self.stdout.write(f"revoked {revoked} token(s)")
        token = tokens.issue(user, name=name)
        self.stdout.write(f"{'created' if created else 'found'} user {username}; new token (shown once, stored hashed):")
        self.stdout.write(token)
