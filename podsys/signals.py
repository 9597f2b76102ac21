"""What PODsys tells the layers above it, which it may not import: Django signals they
connect to in their AppConfig.ready()."""

from django.dispatch import Signal

# A node was taken out of service because it cannot run work (a fatal health check failed, its
# failure confirmed): move the work placed there elsewhere. Sent after the commit (robustly: a
# receiver's failure is logged), and again at each health-check tick while the node still
# holds work, so a receiver must be idempotent. With `node_id` and `reason`, a phrase completing
# "moved off <node>: ..." ("it failed health check gpu-presence (7 of 8 GPUs found)").
node_out_of_service = Signal()
