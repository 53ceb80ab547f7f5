from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from rest_framework.authtoken.models import Token


class Command(BaseCommand):
    help = "Create USERNAME if needed and print an API token for it (the token is the last line)."

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--password", help="also set this password, for signing in to the web page")
        parser.add_argument("--staff", action="store_true", help="make the user staff (admin access)")
        parser.add_argument(
            "--moderator", action="store_true",
            help="staff with the review permission (safety.review_content): the admin's review queue",
        )
        parser.add_argument("--rotate", action="store_true", help="revoke the old token and issue a new one")

    def handle(self, username, password, staff, rotate, moderator=False, **options):
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
            Token.objects.filter(user=user).delete()
        token, _ = Token.objects.get_or_create(user=user)
        self.stdout.write(f"{'created' if created else 'found'} user {username}")
        self.stdout.write(token.key)
