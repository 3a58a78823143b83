"""Facts the API's validation and the renderer both read: accelerators, the vLLM 0.33 flag table and
compatibility rules, the settings the operator manages, a replica group's layout. Imports nothing of flashserve
but itself, so the API never depends on the renderer."""
