# placeholder, replaced by the bindings
SUCCESS = 0
