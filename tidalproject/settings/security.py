"""Security settings: the log-in lockout (django-axes), API tokens (django-rest-knox), the
content security policy and the other response headers. Imported by ``base``.
"""

from datetime import timedelta

from .environment import env

# --- Log-in lockout (django-axes) -------------------------------------------------------
# The axes backend refuses every log-in (the right password too) of an account from a client
# address once that pair has LOGIN_FAILURE_LIMIT failures within LOGIN_LOCKOUT_MINUTES, until
# the window has passed since the last failure or an operator unlocks it (the admin's Access
# attempts, or `manage.py axes_reset_username`). Per pair, so that an attacker elsewhere
# cannot lock an operator out. Then Django's model backend, reading a user's permissions in
# one query (accounts.backends).
AUTHENTICATION_BACKENDS = ["axes.backends.AxesStandaloneBackend", "accounts.backends.OneQueryModelBackend"]
AXES_FAILURE_LIMIT = env.int("LOGIN_FAILURE_LIMIT", default=5)
AXES_COOLOFF_TIME = timedelta(minutes=env.float("LOGIN_LOCKOUT_MINUTES", default=15))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
# A lockout lasts its window from the last failure before it, not from each refused attempt.
AXES_RESET_COOL_OFF_ON_FAILURE_DURING_LOCKOUT = False
AXES_CLIENT_IP_CALLABLE = "accounts.clientip.client_ip"
AXES_LOCKOUT_CALLABLE = "accounts.lockout.lockout_response"
AXES_ENABLE_ACCESS_FAILURE_LOG = True
AXES_SENSITIVE_PARAMETERS = ["password"]
# Behind a proxy: the header it sets to the client's address (e.g. X-Real-IP, or
# X-Forwarded-For, of which the right-most address is used). Unset: the TCP peer's address.
CLIENT_IP_HEADER = env.str("CLIENT_IP_HEADER", default="")

# --- API tokens (django-rest-knox) ------------------------------------------------------
# Stored as SHA-512 hashes; each expires. Service accounts' tokens live longer; rotation
# (`manage.py rotate_token`) leaves the old ones working for the overlap.
REST_KNOX = {
    "TOKEN_TTL": timedelta(hours=env.float("API_TOKEN_TTL_HOURS", default=24)),
    "AUTH_HEADER_PREFIX": "Token",
    "AUTO_REFRESH": False,
}
SERVICE_TOKEN_TTL_DAYS = env.float("SERVICE_TOKEN_TTL_DAYS", default=90)
TOKEN_ROTATION_OVERLAP_HOURS = env.float("TOKEN_ROTATION_OVERLAP_HOURS", default=24)

# --- Content security policy and other headers ------------------------------------------
# No inline script, no inline style, nothing from another origin: the admin, the console and
# the API docs (Swagger UI from drf-spectacular-sidecar, its set-up script as a file) need none.
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": ["'self'"],
        "script-src": ["'self'"],
        "style-src": ["'self'"],
        "img-src": ["'self'", "data:"],
        "font-src": ["'self'"],
        "connect-src": ["'self'"],
        "object-src": ["'none'"],
        "base-uri": ["'none'"],
        "form-action": ["'self'"],
        "frame-ancestors": ["'none'"],
        **({"report-uri": [env.str("CSP_REPORT_URI")]} if env.str("CSP_REPORT_URI", default="") else {}),
    },
}
X_FRAME_OPTIONS = "DENY"
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
SECURE_CROSS_ORIGIN_OPENER_POLICY = "same-origin"
PERMISSIONS_POLICY = "camera=(), microphone=(), geolocation=(), payment=(), usb=()"
