"""The flashserve.io/v1alpha1 API: typed models, validation and the generated CRD."""
