"use strict";
// Every admin page (admin/base_site.html): names for the controls that Django's own admin
// scripts build without one (WCAG 2.2 AA, 4.1.2 Name, Role, Value). Those scripts build them
// when the page is ready or loaded (and again for a formset's added row), so this runs then
// and after any later change to the page; running it twice changes nothing.
{
  const nameControls = () => {
    // The filter box of a "horizontal" many-to-many widget: its label holds only an icon whose
    // aria-label says what the box does, and aria-label is not allowed on a plain span.
    for (const icon of document.querySelectorAll(".help-tooltip.search-label-icon[aria-label]:not([role])")) {
      icon.setAttribute("role", "img");
    }
    // An autocomplete field (select2): its combobox is named by the selected value alone,
    // which is empty until one is chosen. Named by the field's label first, then the value.
    for (const select of document.querySelectorAll("select.admin-autocomplete[id]")) {
      const label = document.querySelector(`label[for="${select.id}"]`);
      const rendered = document.getElementById(`select2-${select.id}-container`);
      if (!label || !rendered) continue;
      label.id = label.id || `${select.id}_label`;
      const names = `${label.id} ${rendered.id}`;
      rendered.setAttribute("aria-labelledby", names);
      rendered.closest(".select2-selection")?.setAttribute("aria-labelledby", names);
    }
  };
  let queued = false;
  const later = () => {
    if (queued) return;
    queued = true;
    queueMicrotask(() => { queued = false; nameControls(); });
  };
  document.addEventListener("DOMContentLoaded", () => {
    nameControls();
    new MutationObserver(later).observe(document.body, { childList: true, subtree: true });
  });
  window.addEventListener("load", nameControls);
}
