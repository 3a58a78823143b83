"""The kopf controller: thin handlers around pure planning (plan.py) and status (status.py)."""
