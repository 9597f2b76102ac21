"""OGAI settings. Every value comes from the environment; see the README for the full list.

`OGAI_PROFILE=production` switches the secure defaults on (no DEBUG, HTTPS-only cookies, HSTS,
hashed static files) and makes SECRET_KEY mandatory; it passes `manage.py check --deploy`.
"""

import ipaddress
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from ogai.env import (
    env_bool,
    env_float_or_none,
    env_floats_or_none,
    env_int,
    env_list,
    env_str,
    persistent_secret_key,
    private_path,
)

BASE_DIR = Path(__file__).resolve().parent.parent
PROFILE = env_str("OGAI_PROFILE", "development")
if PROFILE not in {"development", "production"}:
    raise ImproperlyConfigured(f"OGAI_PROFILE={PROFILE!r}: use development or production.")
PRODUCTION = PROFILE == "production"

DATA_DIR = private_path(Path(env_str("OGAI_DATA_DIR", str(BASE_DIR / "var"))).resolve(),
                        folder=True)

DEBUG = env_bool("DEBUG", not PRODUCTION)
SECRET_KEY = env_str("SECRET_KEY")
if not SECRET_KEY:
    if not DEBUG:
        raise ImproperlyConfigured("SECRET_KEY must be set when DEBUG is off.")
    SECRET_KEY = persistent_secret_key(DATA_DIR)

ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]"])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_htmx",
    "django_tables2",
    # OGAI, lowest layer first: the order is the dependency order.
    "ogai",
    "infra_os",
    "podsys",
    "aistation",
    "ylink",
    "mmodel",
    "frontend",
]

MIDDLEWARE = [
    # First, so /metrics counts and times every request whole.
    "ogai.metrics.MetricsMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "ogai.log_context.RequestIdMiddleware",
    "ogai.request_context.RequestContextMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    # Before the CSRF check, which would read (and spool) a whole upload first.
    "ylink.middleware.UploadSizeMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    # A service's refusal in the console: a 403/400 page and one log line, not a traceback.
    "frontend.middleware.RefusalMiddleware",
]

ROOT_URLCONF = "ogai.urls"
WSGI_APPLICATION = "ogai.wsgi.application"
ASGI_APPLICATION = "ogai.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "frontend.context_processors.console",
            ],
        },
    },
]

# Database: SQLite in the data directory unless DATABASE_URL names another.
DATABASES = {
    "default": dj_database_url.parse(
        env_str("DATABASE_URL") or f"sqlite:///{DATA_DIR / 'ogai.sqlite3'}",
        conn_max_age=env_int("DATABASE_CONN_MAX_AGE", 0),
    )
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    if not env_str("DATABASE_URL"):
        private_path(DATA_DIR / "ogai.sqlite3", folder=False)
    # The web server, the worker and beat write to one file: wait for locks instead of failing,
    # take the write lock up front, and let readers work beside a writer.
    # A file, not memory, so a worker process started by a test sees the test database.
    DATABASES["default"]["TEST"] = {"NAME": str(DATA_DIR / "test.sqlite3")}
    DATABASES["default"]["OPTIONS"] = {
        "timeout": 30,
        "transaction_mode": "IMMEDIATE",
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    }
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
LOGIN_URL = "frontend:login"
LOGIN_REDIRECT_URL = "frontend:dashboard"
LOGOUT_REDIRECT_URL = "frontend:login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = env_str("TIME_ZONE", "UTC")
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
# collectstatic's folder; the image collects into its own (OGAI_STATIC_ROOT), since a volume
# mounted at OGAI_DATA_DIR would hide files collected there at build time.
STATIC_ROOT = Path(env_str("OGAI_STATIC_ROOT", str(DATA_DIR / "static")))
STATIC_ROOT.mkdir(parents=True, exist_ok=True)
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": (
            "whitenoise.storage.CompressedManifestStaticFilesStorage"
            if PRODUCTION
            else "django.contrib.staticfiles.storage.StaticFilesStorage"
        )
    },
}
# Outside production, serve straight from the apps' static folders: no collectstatic step.
WHITENOISE_USE_FINDERS = not PRODUCTION

# Request bodies: larger JSON or form bodies are refused with a 400 naming the limit.
DATA_UPLOAD_MAX_MEMORY_SIZE = env_int("OGAI_MAX_REQUEST_BYTES", 1024 * 1024)

# Security: production serves over HTTPS behind a proxy that sets X-Forwarded-Proto.
SESSION_COOKIE_SECURE = PRODUCTION
CSRF_COOKIE_SECURE = PRODUCTION
SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", PRODUCTION)
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https") if PRODUCTION else None
SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 31536000 if PRODUCTION else 0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = PRODUCTION
SECURE_HSTS_PRELOAD = PRODUCTION
# Probes and Prometheus scrapes come over plain HTTP from inside the cluster.
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^readyz$", r"^metrics$"]
X_FRAME_OPTIONS = "DENY"

# The platform's own logs: one JSON object a line on stderr (OGAI_LOG_FORMAT=plain for
# people), and into the log store, where operators search them beside every job's output.
OGAI_LOG_FORMAT = env_str("OGAI_LOG_FORMAT", "json")
if OGAI_LOG_FORMAT not in ("json", "plain"):
    raise ImproperlyConfigured(f"OGAI_LOG_FORMAT={OGAI_LOG_FORMAT!r}: use json or plain.")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"},
                   "json": {"()": "ogai.log_context.JsonFormatter"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": OGAI_LOG_FORMAT},
                 "store": {"class": "aistation.logstore.handler.StoreHandler"}},
    "root": {"handlers": ["console", "store"], "level": env_str("LOG_LEVEL", "INFO")},
}

# The log store (aistation/logstore): see its config module for OGAI_LOGS_URL.
OGAI_LOGS_URL = env_str("OGAI_LOGS_URL", "")
OGAI_LOGS_PLATFORM = env_bool("OGAI_LOGS_PLATFORM", True)  # the platform's lines too
OGAI_LOGS_FLUSHER = True  # a thread sends buffered platform lines (tests send them by hand)
OGAI_LOGS_BUFFER_LINES = env_int("OGAI_LOGS_BUFFER_LINES", 10000)
OGAI_LOGS_SHIP_INTERVAL_S = float(env_str("OGAI_LOGS_SHIP_INTERVAL_S", "2"))
# Transactions a shipping pass writes at once into a PostgreSQL store (SQLite takes one).
OGAI_LOGS_WRITERS = env_int("OGAI_LOGS_WRITERS", 2)
# Days the platform's own lines are kept (tenants' job output: each tenant's setting).
OGAI_LOGS_PLATFORM_RETENTION_DAYS = env_int("OGAI_LOGS_PLATFORM_RETENTION_DAYS", 30)
# Also send every line to an OpenTelemetry collector (OTLP/HTTP, e.g.
# http://otel-collector:4318/v1/logs); empty: no export.
OGAI_LOGS_OTLP_ENDPOINT = env_str("OGAI_LOGS_OTLP_ENDPOINT", "")

# REST API: JSON, and the browsable API while developing.
_RENDERERS = ["rest_framework.renderers.JSONRenderer"]
if DEBUG:
    _RENDERERS.append("rest_framework.renderers.BrowsableAPIRenderer")
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "infra_os.api.authentication.ApiTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_PAGINATION_CLASS": "ogai.api.pagination.LimitOffsetPagination",
    "DEFAULT_FILTER_BACKENDS": ["django_filters.rest_framework.DjangoFilterBackend"],
    "DEFAULT_PARSER_CLASSES": [
        "ogai.api.parsers.JSONParser",
        "rest_framework.parsers.FormParser",
        "rest_framework.parsers.MultiPartParser",
    ],
    "DEFAULT_RENDERER_CLASSES": _RENDERERS,
    "DEFAULT_SCHEMA_CLASS": "ogai.api.schema.AutoSchema",
    "EXCEPTION_HANDLER": "ogai.api.errors.exception_handler",
    # `?format=` filters dataset and model versions; as DRF's renderer switch it made every
    # such filter a 404.
    "URL_FORMAT_OVERRIDE": None,
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
}

SPECTACULAR_SETTINGS = {
    "TITLE": "OGAI API",
    "DESCRIPTION": "The REST API of OGAI, a platform for the whole life of large models on GPU "
    "clusters. Authenticate with a session or an API token: `Authorization: Bearer <token>`.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # Nothing from outside the site: no online validator badge, system fonts for ReDoc (its
    # default fonts would come from Google).
    "SWAGGER_UI_SETTINGS": {"deepLinking": True, "validatorUrl": None},
    "REDOC_UI_SETTINGS": {"theme": {"typography": {
        "fontFamily": "system-ui, -apple-system, 'Segoe UI', Roboto, sans-serif",
        "headings": {"fontFamily": "system-ui, -apple-system, 'Segoe UI', Roboto, sans-serif"},
    }}},
    "COMPONENT_SPLIT_REQUEST": True,
    "SCHEMA_PATH_PREFIX": r"/api/v1",
    "ENUM_NAME_OVERRIDES": {
        "MembershipRoleEnum": "infra_os.choices.Role",
        "JobStateEnum": "aistation.choices.JobState",
        "AttemptStateEnum": "aistation.choices.AttemptState",
        "JobKindEnum": [("job", "job"), ("ray", "ray")],
        "TokenStateEnum": [("active", "active"), ("expired", "expired"), ("revoked", "revoked")],
        "ProvisioningRunStateEnum": "infra_os.choices.RunState",
        "ProvisioningBatchStateEnum": "infra_os.choices.BatchState",
        "InvoiceStateEnum": "infra_os.choices.InvoiceState",
        "RatedResourceEnum": "infra_os.choices.RatedResource",
        "UsageResourceEnum": "infra_os.selectors_billing.USAGE_RESOURCE_CHOICES",
        "DatasetKindEnum": "ylink.choices.DatasetKind",
        "TrainingKindEnum": "ylink.choices.TrainingKind",
        "RunnerEventKindEnum": "ylink.choices.RUNNER_EVENT_KINDS",
        "BenchmarkKindEnum": "mmodel.choices.BenchmarkKind",
        # PODsys' deployment runs and MModel's model deployments both have a `state`.
        "DeploymentRunStateEnum": "podsys.choices.DeploymentState",
        "DeploymentStateEnum": "mmodel.choices.DeploymentState",
        "DeploymentTaskStatusEnum": "podsys.choices.TaskStatus",
        # Named once a second `status` choice set (deployment task results) appeared.
        "VersionStatusEnum": "mmodel.choices.VersionStatus",
        "DeploymentHostStateEnum": "podsys.selectors_stack.HOST_STATE_CHOICES",
    },
}

# Celery: the filesystem transport in the data directory needs no server; Redis when set.
CELERY_BROKER_URL = env_str("CELERY_BROKER_URL") or "filesystem://"
if CELERY_BROKER_URL.startswith("filesystem://"):
    _queue_dir = DATA_DIR / "celery" / "queue"
    _processed_dir = DATA_DIR / "celery" / "processed"
    _control_dir = DATA_DIR / "celery" / "control"
    for _folder in (_queue_dir, _processed_dir, _control_dir):
        _folder.mkdir(parents=True, exist_ok=True)
    CELERY_BROKER_TRANSPORT = "ogai.broker:Transport"
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_queue_dir),
        "data_folder_out": str(_queue_dir),
        "processed_folder": str(_processed_dir),
        "control_folder": str(_control_dir),
        "store_processed": False,
        "polling_interval": 0.1,
    }
    _default_results = f"file://{DATA_DIR / 'celery' / 'results'}"
    (DATA_DIR / "celery" / "results").mkdir(parents=True, exist_ok=True)
else:
    _default_results = CELERY_BROKER_URL
CELERY_RESULT_BACKEND = env_str("CELERY_RESULT_BACKEND") or _default_results
CELERY_RESULT_EXPIRES = 3600
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_TASK_TIME_LIMIT = 600
CELERY_TASK_SOFT_TIME_LIMIT = 540
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# Keep LOGGING's handlers (JSON on stderr, the log store) in workers and beat too.
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_TASK_DEFAULT_QUEUE = "default"
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# Periodic work, by task name. The reconcile interval is also how soon a finished job is seen.
RECONCILE_INTERVAL_S = float(env_str("OGAI_RECONCILE_INTERVAL_S", "5"))
SCHEDULE_INTERVAL_S = float(env_str("OGAI_SCHEDULE_INTERVAL_S", "10"))
CELERY_BEAT_SCHEDULE: dict[str, dict] = {
    "reconcile-attempts": {"task": "aistation.reconcile", "schedule": RECONCILE_INTERVAL_S},
    "schedule-cycle": {"task": "aistation.schedule_cycle", "schedule": SCHEDULE_INTERVAL_S},
    "dispatch-fleets": {"task": "aistation.fleet_dispatch", "schedule": SCHEDULE_INTERVAL_S},
    "sync-nodes": {"task": "podsys.sync_nodes", "schedule": 60.0},
    "cull-notebooks": {"task": "aistation.cull_notebooks", "schedule": 60.0},
    "sweep-provisioning": {"task": "infra_os.sweep_provisioning", "schedule": 15.0},
    "sweep-leases": {"task": "infra_os.sweep_leases", "schedule": 60.0},
    "watch-deployments": {"task": "mmodel.watch_deployments",
                          "schedule": float(env_str("OGAI_DEPLOYMENT_WATCH_S", "5"))},
    "collect-node-metrics": {"task": "podsys.collect_metrics",
                             "schedule": float(env_str("OGAI_METRICS_INTERVAL_S", "30"))},
    "run-health-checks": {"task": "podsys.run_health_checks", "schedule": 30.0},
    "sweep-deployment-runs": {"task": "podsys.sweep_deployment_runs", "schedule": 60.0},
    # A pass not started soon is dropped: the next one reads the same lines.
    "ship-logs": {"task": "aistation.logs_ship", "schedule": OGAI_LOGS_SHIP_INTERVAL_S,
                  "options": {"expires": max(10.0, 5 * OGAI_LOGS_SHIP_INTERVAL_S)}},
    "expire-logs": {"task": "aistation.logs_expire", "schedule": 3600.0},
}
CELERY_BEAT_SCHEDULE_FILENAME = str(DATA_DIR / "celerybeat-schedule")
CELERY_TIMEZONE = TIME_ZONE

# Behind a reverse proxy, take the client address (audit log, sign-in throttle, /metrics,
# provisioning callbacks) from X-Forwarded-For, but only from the proxies named here (CIDRs of
# their own addresses, never of the clients'): anyone else's header is ignored.
OGAI_USE_X_FORWARDED_FOR = env_bool("OGAI_USE_X_FORWARDED_FOR", False)
OGAI_TRUSTED_PROXIES = env_list("OGAI_TRUSTED_PROXIES", [])
if OGAI_USE_X_FORWARDED_FOR and not OGAI_TRUSTED_PROXIES:
    raise ImproperlyConfigured(
        "OGAI_USE_X_FORWARDED_FOR is on: name the proxies whose X-Forwarded-For to believe in "
        "OGAI_TRUSTED_PROXIES (e.g. 127.0.0.1/32 for a proxy on this host).")
for _network in OGAI_TRUSTED_PROXIES:
    try:
        ipaddress.ip_network(_network, strict=False)
    except ValueError:
        raise ImproperlyConfigured(
            f"OGAI_TRUSTED_PROXIES: {_network!r} is not an address or a CIDR.") from None
# Sign-in throttling (API, console and admin alike; counted in the cache): attempts per client
# address, and failed attempts per username from any address ("N/period": 20/minute, 10/15min).
OGAI_LOGIN_RATE = env_str("OGAI_LOGIN_RATE", "20/minute")
OGAI_LOGIN_FAILURE_RATE = env_str("OGAI_LOGIN_FAILURE_RATE", "10/15min")
# A tenant's invitation can be accepted for this many days.
OGAI_INVITATION_DAYS = env_int("OGAI_INVITATION_DAYS", 7)

# Cluster drivers by name, like Django's cache backends: a cluster names one of these.
OGAI_CLUSTER_DRIVERS = {
    "local": "podsys.drivers.local.LocalDriver",
    "fake": "podsys.drivers.fake.FakeDriver",
    "kubernetes": "podsys.drivers.kubernetes.KubernetesDriver",
    "slurm": "podsys.drivers.slurm.SlurmDriver",
}
# The `fake` driver's clusters and the simulated cloud (the demo fleet) keep their state in files
# in this folder, which the web, the worker's processes and beat all share, on the wall clock.
# Empty: in each process's memory, on a clock only the tests move (the tests' own setting).
OGAI_FAKE_STATE_DIR = env_str("OGAI_FAKE_STATE_DIR", str(DATA_DIR / "fakes"))
# Where work runs is a tenant boundary. On the local cluster each tenant's processes run in a
# bubblewrap sandbox as uid (and gid) SANDBOX_UID_BASE + the tenant's id, never as the platform's
# own user. Where that cannot be done here (no bubblewrap, no user namespaces, the platform not
# root), tenants' work is refused, unless this platform serves a single tenant, which may then
# run it without the sandbox.
OGAI_SANDBOX_UID_BASE = env_int("OGAI_SANDBOX_UID_BASE", 1_000_000_000)
OGAI_SINGLE_TENANT = env_bool("OGAI_SINGLE_TENANT", False)
# Encrypts secrets at rest (cluster kubeconfigs): Fernet keys, newest first, comma-separated;
# unset: a key derived from SECRET_KEY.
OGAI_ENCRYPTION_KEY = env_str("OGAI_ENCRYPTION_KEY", "")

# Jobs: the first retry waits this long, doubling per restart (at most 10 minutes); an
# attempt decided but not launched after the grace period is launched by reconcile.
OGAI_RETRY_BACKOFF_S = float(env_str("OGAI_RETRY_BACKOFF_S", "10"))
OGAI_LAUNCH_GRACE_S = float(env_str("OGAI_LAUNCH_GRACE_S", "30"))
# Where a job's processes reach the platform's API (a notebook's SDK): this machine's server
# by default; behind Kubernetes, the platform's Service URL.
OGAI_INTERNAL_URL = env_str(
    "OGAI_INTERNAL_URL",
    f"http://{env_str('OGAI_HOST', '127.0.0.1')}:{env_str('OGAI_PORT', '8000')}",
)
# The scheduler's policy settings (unset: the defaults in `aistation.scheduler.policies`, which
# say what they mean): the wait after which a job goes first and gets nodes reserved, the fair
# policy's levels (attained GPU-seconds, comma-separated), the minimum run before a job of a
# higher level may preempt, the total wait that promotes a job to the top level, and how that
# bound stretches with the tenant's backlog (past PROMOTE_BACKLOG quotas' worth of waiting GPUs,
# PROMOTE_STRETCH x PROMOTE_AFTER_S more per quota's worth, up to PROMOTE_MAX_S; 0 keeps it fixed).
OGAI_SCHEDULER_STARVATION_S = env_float_or_none("OGAI_SCHEDULER_STARVATION_S")
OGAI_SCHEDULER_LEVELS_GPU_S = env_floats_or_none("OGAI_SCHEDULER_LEVELS_GPU_S")
OGAI_SCHEDULER_MIN_RUN_S = env_float_or_none("OGAI_SCHEDULER_MIN_RUN_S")
OGAI_SCHEDULER_PROMOTE_AFTER_S = env_float_or_none("OGAI_SCHEDULER_PROMOTE_AFTER_S")
OGAI_SCHEDULER_PROMOTE_BACKLOG = env_float_or_none("OGAI_SCHEDULER_PROMOTE_BACKLOG")
OGAI_SCHEDULER_PROMOTE_STRETCH = env_float_or_none("OGAI_SCHEDULER_PROMOTE_STRETCH")
OGAI_SCHEDULER_PROMOTE_MAX_S = env_float_or_none("OGAI_SCHEDULER_PROMOTE_MAX_S")

# Fleets: a cluster whose nodes have not synced for this long (its driver failing) is lost; its
# queued jobs go back to the fleet's dispatcher (running ones stay: they are never started twice).
OGAI_CLUSTER_LOST_S = float(env_str("OGAI_CLUSTER_LOST_S", "900"))

# YLink datasets: the largest upload (MiB, checked before anything is stored) and the most
# files a zip may hold.
OGAI_DATASET_MAX_UPLOAD_MIB = env_int("OGAI_DATASET_MAX_UPLOAD_MIB", 2048)
OGAI_DATASET_MAX_FILES = env_int("OGAI_DATASET_MAX_FILES", 10000)
# Working folders shipped with jobs: the largest archive, and the most its files may unpack to
# (MiB). Code and small files ship with a job; data goes through datasets.
OGAI_WORKDIR_MAX_MB = env_int("OGAI_WORKDIR_MAX_MB", 200)

# How long /readyz waits for a worker to answer its health task.
OGAI_READY_WORKER_TIMEOUT = float(env_str("OGAI_READY_WORKER_TIMEOUT", "5"))

# ASGI apps mounted beside Django, by path prefix (see ogai/asgi.py): the proxy of notebooks
# and of Ray jobs' dashboards, and the OpenAI-compatible gateway.
OGAI_ASGI_MOUNTS = {"/notebooks/": "aistation.proxy.application",
                    "/ray-dashboards/": "aistation.proxy.application",
                    "/v1/": "mmodel.gateway.application"}

# The cache: Redis when OGAI_CACHE_URL is set (redis://host:6379/1), else this process's
# memory (`make run` has one web process). The gateway's rate limits count in it, so with more
# than one web process it must be Redis.
_cache_url = env_str("OGAI_CACHE_URL")
CACHES = {"default": (
    {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": _cache_url,
     "KEY_PREFIX": "ogai"}
    if _cache_url else
    {"BACKEND": "django.core.cache.backends.locmem.LocMemCache", "LOCATION": "ogai"})}

# MModel. Imports read only below these folders (comma-separated; empty: none allowed); pickle
# weights (.bin/.pt, which run code when loaded) only when the operator allows them.
OGAI_MODEL_IMPORT_ROOTS = env_list("OGAI_MODEL_IMPORT_ROOTS", [str(DATA_DIR / "imports")])
OGAI_MODEL_ALLOW_PICKLE = env_bool("OGAI_MODEL_ALLOW_PICKLE", False)
# vLLM is never installed beside the platform: its `vllm` executable in its own environment
# (local driver) and its image (Kubernetes).
OGAI_VLLM_COMMAND = env_str("OGAI_VLLM_COMMAND", "")
OGAI_VLLM_IMAGE = env_str("OGAI_VLLM_IMAGE", "vllm/vllm-openai:latest")
OGAI_TRANSFORMERS_IMAGE = env_str("OGAI_TRANSFORMERS_IMAGE", "")
# The gateway's default rate limits per minute (a tenant's GatewayLimit overrides them).
OGAI_GATEWAY_TENANT_RPM = env_int("OGAI_GATEWAY_TENANT_RPM", 600)
OGAI_GATEWAY_TENANT_TPM = env_int("OGAI_GATEWAY_TENANT_TPM", 200000)
OGAI_GATEWAY_TOKEN_RPM = env_int("OGAI_GATEWAY_TOKEN_RPM", 300)
OGAI_GATEWAY_TOKEN_TPM = env_int("OGAI_GATEWAY_TOKEN_TPM", 100000)
# A request to a deployment without a ready replica (scaled to zero, or starting) waits this
# long for one before the gateway answers 503 (0: at once). 300 s is Knative Serving's default
# request timeout, the bound its activator holds a request to a revision at zero.
OGAI_GATEWAY_COLD_START_WAIT_S = env_int("OGAI_GATEWAY_COLD_START_WAIT_S", 300)
# A replica whose server stops answering /health for longer than the grace (seconds) gets a new
# job; one that never answered gets until the start timeout (loading the weights).
OGAI_REPLICA_UNHEALTHY_GRACE_S = env_int("OGAI_REPLICA_UNHEALTHY_GRACE_S", 60)
OGAI_REPLICA_START_TIMEOUT_S = env_int("OGAI_REPLICA_START_TIMEOUT_S", 1800)

# PODsys. Stack and accounts deployments: the SSH user and private key Ansible reaches nodes
# with (a node at localhost/127.0.0.1, or of the local cluster, is reached without SSH), and
# how many nodes it works on at once.
OGAI_ANSIBLE_SSH_USER = env_str("OGAI_ANSIBLE_SSH_USER", "root")
OGAI_ANSIBLE_SSH_KEY_FILE = env_str("OGAI_ANSIBLE_SSH_KEY_FILE", "")
OGAI_ANSIBLE_FORKS = env_int("OGAI_ANSIBLE_FORKS", 20)
# Days a finished deployment run's working folder (Ansible's output) is kept; 0 keeps them.
OGAI_DEPLOYMENT_ARTIFACTS_DAYS = env_int("OGAI_DEPLOYMENT_ARTIFACTS_DAYS", 30)
# Slurm stack deployments copy this munge key (a file on the OGAI host) to every node; empty:
# the nodes' munge must already be keyed.
OGAI_SLURM_MUNGE_KEY_FILE = env_str("OGAI_SLURM_MUNGE_KEY_FILE", "")
# The slurm.conf (a file on the OGAI host) of the controller Slurm stack deployments point their
# nodes at: once such a deployment succeeds, its cluster runs its jobs through the slurm driver
# with it, and with OGAI_SLURM_SHARED_DIR as the shared path (empty: the driver's default, the
# cluster's folder in the data directory, which must then be shared with the nodes). Empty: the
# cluster stays on its driver and the run says so.
OGAI_SLURM_CONF = env_str("OGAI_SLURM_CONF", "")
OGAI_SLURM_SHARED_DIR = env_str("OGAI_SLURM_SHARED_DIR", "")
# Cluster accounts get UIDs and GIDs counting up from these, the same on every node.
OGAI_CLUSTER_UID_START = env_int("OGAI_CLUSTER_UID_START", 20000)
OGAI_CLUSTER_GID_START = env_int("OGAI_CLUSTER_GID_START", 20000)
# Node metrics: a Prometheus server to query (its base URL) when the cluster has one (DCGM
# exporter and node exporter scraped there); without it OGAI scrapes the nodes itself every
# OGAI_METRICS_INTERVAL_S and keeps this many hours.
OGAI_PROMETHEUS_URL = env_str("OGAI_PROMETHEUS_URL", "")
OGAI_METRICS_HISTORY_H = float(env_str("OGAI_METRICS_HISTORY_H", "24"))
# OGAI's own /metrics: with a token set, Prometheus sends it as a Bearer token (from anywhere);
# without one, only clients in these networks (CIDRs; loopback and private ranges) may read it.
OGAI_METRICS_TOKEN = env_str("OGAI_METRICS_TOKEN", "")
OGAI_METRICS_NETWORKS = env_list(
    "OGAI_METRICS_NETWORKS",
    ["127.0.0.0/8", "::1/128", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fc00::/7"])
# Health checks by name, like the cluster drivers: a dotted path to a `HealthCheck` class.
OGAI_HEALTH_CHECKS = {
    "gpu-presence": "podsys.health.checks.GpuPresence",
    "driver-version": "podsys.health.checks.DriverVersion",
    "remapped-rows": "podsys.health.checks.RemappedRows",
    "power-slowdown": "podsys.health.checks.PowerSlowdown",
    "pcie-bandwidth": "podsys.health.checks.PcieBandwidth",
    "dcgm-diag": "podsys.health.checks.DcgmDiag",
    "nccl-allreduce": "podsys.health.checks.NcclAllReduce",
    "network": "podsys.health.checks.NetworkReachability",
}
# A fatal check cordons a node after failing this many runs in a row (a failure is re-run at
# once to confirm it); the node returns after the check passes this many times in a row.
OGAI_HEALTH_CORDON_AFTER = env_int("OGAI_HEALTH_CORDON_AFTER", 2)
OGAI_HEALTH_RETURN_AFTER = env_int("OGAI_HEALTH_RETURN_AFTER", 1)
# Checks never cordon more than this fraction of a cluster's nodes (at least one node).
OGAI_HEALTH_MAX_CORDONED_FRACTION = float(env_str("OGAI_HEALTH_MAX_CORDONED_FRACTION", "0.25"))
# The image health-check workloads run in where the driver runs images (Kubernetes): it needs
# Python with OGAI's `podsys` package and nvidia-ml-py (torch for the bandwidth checks); blank:
# the cluster's `default_image`.
OGAI_HEALTH_CHECK_IMAGE = env_str("OGAI_HEALTH_CHECK_IMAGE", "")

# Bare-metal servers: BMC drivers by name, each call's timeout and its retries on transient
# failures (unreachable, garbled answers).
OGAI_BMC_DRIVERS = {"redfish": "infra_os.drivers.redfish.RedfishBmc"}
OGAI_BMC_TIMEOUT_S = float(env_str("OGAI_BMC_TIMEOUT_S", "30"))
OGAI_BMC_RETRIES = env_int("OGAI_BMC_RETRIES", 2)
# Invoices cover calendar months in this time zone (an IANA name).
OGAI_BILLING_TIME_ZONE = env_str("OGAI_BILLING_TIME_ZONE", "UTC")
# Provisioning: how often a run asks the BMC whether the power came on, and how long a failed
# attempt waits before the next.
OGAI_PROVISION_POLL_S = float(env_str("OGAI_PROVISION_POLL_S", "2"))
OGAI_PROVISION_RETRY_S = float(env_str("OGAI_PROVISION_RETRY_S", "15"))
# Networks servers boot on: only they get boot configs and may call back (CIDRs, comma-separated).
OGAI_PROVISIONING_NETWORKS = env_list(
    "OGAI_PROVISIONING_NETWORKS",
    ["127.0.0.0/8", "::1/128", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fc00::/7"])
