"""WSGI entry point (gunicorn). Production settings unless DJANGO_SETTINGS_MODULE says else."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tidalproject.settings.production")

application = get_wsgi_application()
