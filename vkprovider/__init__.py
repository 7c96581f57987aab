"""The virtual kubelet: provider-agnostic node machinery (`node`), the kubelet HTTPS API (`kubelet`),
SPDY/3.1 (`spdy`), pure translators (`forge`), the provider for peered clusters (`remote`) and the
offloading admission webhook (`webhook`). Its process is composed in `gpufed.app.virtual_kubelet`.
"""
