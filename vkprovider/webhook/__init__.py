"""The offloading admission webhook (served by `gpufed controller`): see `vkprovider.webhook.server`."""
